"""Built on the engine, never imported by it: the planner (autotune), the live monitor, the
settings file, the CLI demo and its demo model.
"""
