"""The socket driver: the one owner of a socket's lock, core and waiters."""
