// placement: to be written
