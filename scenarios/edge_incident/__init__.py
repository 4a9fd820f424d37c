"""edge_incident: a simulated event service (service.py, world.py) and its diagnosis agent."""
