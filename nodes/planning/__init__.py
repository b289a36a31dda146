"""Planning: a node's widgets to its policy, and the prompt's networks planned together (auto)."""
