"""Sending one attempt of a claimed delivery: vet its URL again (DNS may have changed since it was
registered), sign the body, and POST it to a vetted address, all within one deadline: a lookup that
does not answer in time is a timeout like any other. A lookup or a socket that cannot be had
(dns.LookupsBusy, sockets.SocketsBusy: errors.OurResourcesBusy) is raised to the caller: no
attempt was made."""

import signing
from partner.outbound import causes, ssrf
from partner.outbound.dns import Lookups
from partner.outbound.transport import AttemptResult, Deadline, Transport

USER_AGENT = "PartnerWebhooks/1.0"
# An organization's attempts hold at most this share of the lookup threads (one per delivery slot):
# eight organizations whose names never answer must each fill theirs before a lookup finds none.
LOOKUP_SHARE = 8
# What a refusal of the target at delivery time is recorded as.
_REFUSALS = {"internal_url": "internal_url", "lookup_timeout": "timeout"}


class Sender:
    """Built once per process from the app's config: the DNS lookups and the HTTP(S) transport."""

    def __init__(self, config):
        concurrency = config["DELIVERY_CONCURRENCY"]
        self.lookups = Lookups(config["RESOLVER"], concurrency, max(1, concurrency // LOOKUP_SHARE))
        self.transport = Transport(config["DELIVERY_CA_BUNDLE"], concurrency)
        self.allowed_networks = config["ALLOWED_NETWORKS"]
        self.timeout = config["DELIVERY_TIMEOUT"]

    def send(self, claim, now_ms: int) -> AttemptResult:
        """POST `claim` (an outbox.Claim), signed at `now_ms`; OurResourcesBusy if its host's lookup
        cannot start or no socket can be had."""
        deadline = Deadline(self.timeout)
        resolve = self.lookups.resolver_for(claim.organization_id, deadline.remaining)
        try:
            target = ssrf.check_url(claim.url, resolve, self.allowed_networks)
        except ssrf.UnsafeUrl as error:
            kind = _REFUSALS.get(error.code, "connection_error")
            detail = (causes.of_timeout(deadline.seconds, "lookup") if kind == "timeout"
                      else causes.bounded(error.detail))
            return AttemptResult(False, None, kind, "", deadline.elapsed_ms(), detail)
        headers = {
            "Content-Type": "application/json",
            "User-Agent": USER_AGENT,
            **signing.signature_headers(claim.secret, claim.event_id, claim.body, now_ms),
            "X-VC-Event": claim.kind,
            "X-VC-Event-Id": claim.event_id,
            "X-VC-Attempt": str(claim.attempt),
        }
        return self.transport.post(target, claim.body, headers, deadline)

    def close_idle(self) -> None:
        """Close the connections idle too long or beyond the budget (sockets.Sockets)."""
        self.transport.sockets.close_idle()

    def close_idle_to(self, url: str) -> None:
        """Close the idle connections to `url`'s scheme, host and port: its subscription is gone."""
        try:
            self.transport.pools.close_idle_to(*ssrf.origin(url))
        except ssrf.UnsafeUrl:  # a URL refused now was never dialled
            pass
