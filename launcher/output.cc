// output: to be written
