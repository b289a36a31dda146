"""What moves: splitting a model into groups (grouping.py), where each tensor sits in its
group's one slab and how a module is pointed at a slab (layout.py), and the plan that says which
group lives where before anything moves (plan.py); and a host's network built with the tensors
its checkpoint holds on the meta device (meta_build.py).
"""
