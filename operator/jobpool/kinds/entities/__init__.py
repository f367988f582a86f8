"""Entity types and their attributes, shared by the imports and indexes slices."""
