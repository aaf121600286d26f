// options: to be written
