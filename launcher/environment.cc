// environment: to be written
