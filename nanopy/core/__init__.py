"""The Sans-I/O layer: protocol core base classes, queues, the SP wire codec, messages, errors, options, stats."""
