"""The SQL stores: one engine (``_engine``) over a driver per database."""
