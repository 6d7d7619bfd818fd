def check(obj: object, max_depth: int, max_bytes: int, /) -> str | None:
    """The reason of the first JSON-data violation of ``obj``, or ``None``."""
