"""The disk tier, whole: every file Ferry opens, writes, maps, repairs or fsyncs for it.

Reading: what to read (plan.py: chunks, their checksums, the file's identity, the window
around them), the one reader that executes it (reader.py: its thread, bounce buffers, the
O_DIRECT fallback), the platform's file calls behind it (files.py chooses the backend;
posix.py is Linux, macOS and the BSDs, portable.py Windows) and the memory reads land in
(host_memory.py). Ferry's folder: checked and claimed (folder.py), its group files written and
deleted (store.py), written whole or not at all (durable.py: the one atomic write and folder
fsync, which the quantized cache and the settings file use too), rewritten when damaged
(repair.py). The sources that read them: into a slot (file_source.py), or computed from in
place on a CPU (mapped.py); the mappings the groups' host forms view (mappings.py). What the
sources ask of the transfers above is loads.py.
"""
