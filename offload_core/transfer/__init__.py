"""How bytes move to the onload device: the backends, the buffers, the copies and their waits."""
