// job_service: to be written
