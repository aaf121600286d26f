// hostfile: to be written
