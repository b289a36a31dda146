"""Reading a group's bytes from a file: what to read (plan.py: chunks, their checksums, the
file's identity, the window around them), the one reader that executes it (reader.py: its
thread, bounce buffers, the O_DIRECT fallback), and the platform's file calls behind the
reader (files.py chooses the backend; posix.py is Linux and the BSDs).
"""
