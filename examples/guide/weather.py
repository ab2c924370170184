"""Weather updates over PUB/SUB (the Guide's weather server and client).

The server publishes "ZIP TEMPERATURE HUMIDITY" lines as fast as it can; the
client subscribes to one zip code (SUB filters by prefix, locally) and prints
the average temperature over a number of updates.

    python examples/guide/weather.py                  # both, in one process
    python examples/guide/weather.py server tcp://127.0.0.1:5556
    python examples/guide/weather.py client tcp://127.0.0.1:5556 10003
"""

from __future__ import annotations

import random
import sys
import threading

import nanopy

UPDATES = 50


def server(pub: nanopy.Socket, stop: threading.Event) -> None:
    """Publish random weather until ``stop`` is set."""
    rng = random.Random(42)
    while not stop.is_set():
        zipcode = rng.randrange(10000, 10010)  # a small range: each zip gets ~10% of updates
        temperature = rng.randrange(-80, 135)
        humidity = rng.randrange(10, 60)
        pub.send(b"%05d %d %d" % (zipcode, temperature, humidity))


def client(url: str, zipcode: str = "10001", updates: int = UPDATES) -> float:
    with nanopy.Socket("sub", connect=url, recv_timeout=10.0) as sub:
        # The trailing space keeps "10001" from also matching "100010".
        sub.subscribe(f"{zipcode} ")
        total = 0
        for _ in range(updates):
            _zip, temperature, _humidity = sub.recv().split()
            total += int(temperature)
    average = total / updates
    print(f"Average temperature for zipcode '{zipcode}' was {average:.1f}F over {updates} updates")
    return average


def main(argv: list[str]) -> None:
    if argv and argv[0] == "server":
        with nanopy.Socket("pub", bind=argv[1]) as pub:
            try:
                server(pub, threading.Event())  # until Ctrl-C
            except KeyboardInterrupt:
                pass
        return
    if argv and argv[0] == "client":
        client(argv[1], *argv[2:3])
        return
    stop = threading.Event()
    with nanopy.Socket("pub", bind="tcp://127.0.0.1:0") as pub:
        url = pub.endpoints[0].url
        publisher = threading.Thread(target=server, args=(pub, stop))
        publisher.start()
        try:
            client(url)
        finally:
            stop.set()
            publisher.join()


if __name__ == "__main__":
    main(sys.argv[1:])
