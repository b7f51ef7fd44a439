"""Sending one attempt of a claimed delivery: vet its URL again (DNS may have changed since it was
registered), sign the body, and POST it to a vetted address, all within one deadline: a lookup that
does not answer in time is a timeout like any other."""

import signing
from partner.outbound import causes, ssrf
from partner.outbound.dns import Lookups
from partner.outbound.transport import AttemptResult, Deadline, Transport

USER_AGENT = "PartnerWebhooks/1.0"
# What a refusal of the target at delivery time is recorded as.
_REFUSALS = {"internal_url": "internal_url", "lookup_timeout": "timeout"}


class Sender:
    """Built once per process from the app's config: the DNS lookups and the HTTP(S) transport."""

    def __init__(self, config):
        self.lookups = Lookups(config["RESOLVER"], threads=max(1, config["DELIVERY_CONCURRENCY"] // 2))
        self.transport = Transport(config["DELIVERY_CA_BUNDLE"], config["DELIVERY_CONCURRENCY"])
        self.allowed_networks = config["ALLOWED_NETWORKS"]
        self.timeout = config["DELIVERY_TIMEOUT"]

    def send(self, claim, now_ms: int) -> AttemptResult:
        """POST `claim` (an outbox.Claim), signed at `now_ms`."""
        deadline = Deadline(self.timeout)
        try:
            target = ssrf.check_url(claim.url, self.lookups.within(deadline.remaining()), self.allowed_networks)
        except ssrf.UnsafeUrl as error:
            kind = _REFUSALS.get(error.code, "connection_error")
            detail = (causes.of_timeout(deadline.seconds, "lookup") if kind == "timeout"
                      else causes.bounded(error.detail))
            return AttemptResult(False, None, kind, "", deadline.elapsed_ms(), detail)
        headers = {
            "Content-Type": "application/json",
            "User-Agent": USER_AGENT,
            **signing.signature_headers(claim.secret, claim.body, now_ms),
            "X-VC-Event": claim.kind,
            "X-VC-Event-Id": claim.event_id,
            "X-VC-Attempt": str(claim.attempt),
        }
        return self.transport.post(target, claim.body, headers, deadline)
