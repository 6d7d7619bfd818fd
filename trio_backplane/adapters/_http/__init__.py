"""What the HTTP providers share, written once: server-sent events read
bounded, a stream read to its end (or its tail), errors classed from a
status and its body, the API key kept out of every error, tool names
aliased, server text made Unicode.

Private: each provider package (``openai``, ``anthropic``) checks its extra
is installed before importing this one.
"""
