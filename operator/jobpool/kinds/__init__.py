"""Built-in job kinds, one module each, registered through the `jobpool.kinds` entry points."""
