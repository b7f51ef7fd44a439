"""The baseline client of delivery_throughput: a plain `requests` loop, N threads, one POST per event.

`requests.post` opens a new connection per request, as the service must (every attempt connects to
freshly vetted addresses); `--keep-alive` reuses one Session per thread instead, for reference.
Prints the elapsed seconds.
"""

import argparse
import time

import requests

from harness import run_threads


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("url")
    parser.add_argument("--count", type=int, required=True)
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument("--body-bytes", type=int, default=320)
    parser.add_argument("--keep-alive", action="store_true")
    args = parser.parse_args()
    body = b'{"event":"vc.test.ping","data":"' + b"x" * max(0, args.body_bytes - 34) + b'"}'
    headers = {"Content-Type": "application/json"}
    failures = []

    def worker(offset: int) -> None:
        with requests.Session() as session:
            session.trust_env = False
            for i in range(offset, args.count, args.threads):
                sent = {**headers, "X-VC-Event-Id": f"base_{i}"}
                if args.keep_alive:
                    response = session.post(args.url, data=body, headers=sent, timeout=10)
                else:
                    with requests.Session() as once:  # what requests.post does, minus proxy variables
                        once.trust_env = False
                        response = once.post(args.url, data=body, headers=sent, timeout=10)
                if response.status_code != 200:
                    failures.append(response.status_code)

    started = time.monotonic()
    run_threads(worker, args.threads)
    print(f"{time.monotonic() - started:.6f} {len(failures)}")


if __name__ == "__main__":
    main()
