"""File formats Ferry reads and writes itself: safetensors (one dtype table, a header parser
with bounds checks, one tensor at a time, aligned headers for the group files).
"""
