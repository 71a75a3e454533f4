# The in-computer DevTools bridge: a unix socket that forwards each connection to the browser's loopback DevTools port.
#
# Run as: python3 devtools_bridge.py <socket path> <port>
# For machines whose loopback this process cannot reach but whose socket directory it shares
# (a container's X socket directory, or the screen gateway's): the page tools dial the socket and
# speak DevTools through it. Standard library only; the socket is the owner's only (mode 0600);
# SIGTERM removes it. A browser that no longer answers on its port is gone (a new one listens
# on another port, with a bridge of its own): the bridge then ends and removes its socket.

import asyncio
import os
import signal
import sys


async def pipe(reader, writer):
    try:
        while True:
            data = await reader.read(65536)
            if not data:
                break
            writer.write(data)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        try:
            writer.close()
        except Exception:
            pass


async def main(path, port):
    async def serve(client_reader, client_writer):
        try:
            browser_reader, browser_writer = await asyncio.open_connection("127.0.0.1", port)
        except OSError:
            client_writer.close()
            stopped.set()
            return
        await asyncio.gather(pipe(client_reader, browser_writer), pipe(browser_reader, client_writer))

    stopped = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        loop.add_signal_handler(sig, stopped.set)
    try:
        os.unlink(path)
    except OSError:
        pass
    old = os.umask(0o077)
    server = await asyncio.start_unix_server(serve, path=path)
    os.umask(old)
    try:
        await stopped.wait()
    finally:
        server.close()
        try:
            os.unlink(path)
        except OSError:
            pass


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.stderr.write("usage: devtools_bridge.py <socket path> <port>\n")
        sys.exit(2)
    asyncio.run(main(sys.argv[1], int(sys.argv[2])))
