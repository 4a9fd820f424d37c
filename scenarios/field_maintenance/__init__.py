"""field_maintenance: a simulated fleet (data/, see generate_data.py) and its service manual."""
