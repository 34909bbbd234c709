"""Live capture: exceptions, stacks and user state turned into a plain-data Incident, bounded and scrubbed."""
