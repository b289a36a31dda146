"""Where a group's bytes wait between forwards, one file per kind behind one interface
(base.py: WeightSource): a host slab (host_slab.py), a file read into a slot (file_source.py:
Ferry's group file or the user's checkpoint), a mapped group file (mapped.py), a resident
device buffer (resident.py). placement.py chooses a group's source; store.py, disk_folder.py,
reads.py and checkpoint.py are the disk tier's files, folder, checked reads and checkpoint index.
"""
