"""The data kinds' shared code: entity types, attribute validation, index names."""
