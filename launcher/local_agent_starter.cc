// local_agent_starter: to be written
