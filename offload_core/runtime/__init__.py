"""The forward-time machinery: the schedule (a state machine in plain Python), the engine
that hooks the model and carries the schedule out, the groups at run time, counters and memory
readings.
"""
