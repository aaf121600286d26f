// rendezvous: to be written
