// job: to be written
