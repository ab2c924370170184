"""The socket facade: the public Socket and its parts (messaging, pipes, requests, multipart, poller)."""
