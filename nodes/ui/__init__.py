"""What a user sees beside the nodes: the /ferry/ routes, the sidebar's pushed stats, the report."""
