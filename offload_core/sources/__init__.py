"""Where a group's bytes wait between forwards, and where they come from.

lay_out.py lays every model out into one ``Placement`` (placement.py), which repair_group.py
repairs and give_back.py gives back when the layout ends; its origin (origin.py: the model's own
tensors; checkpoint_origin.py: a meta-built model's checkpoint) says where the bytes come
from. The kinds of source (kinds.py, in order) are a host slab (host_slab.py), the user's
checkpoint or Ferry's group file (the disk tier's sources, in disk/: file_source.py,
mapped.py); a group kept on the device is resident.py. The checkpoint index (checkpoint.py)
alone knows a checkpoint; checkpoint_stream.py matches a meta model to it.
"""
