"""psycopg 3 I/O: connections, the queue store, migrations."""
