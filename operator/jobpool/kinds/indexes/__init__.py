"""Index builds on `mdm.ddm_entity`: reindex (search vectors), index_sync (one attribute's
expression index) and gin_backfill (a type's GIN index), built online."""
