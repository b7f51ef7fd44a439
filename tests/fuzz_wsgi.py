"""The service as gunicorn serves it to schemathesis (tests/test_schemathesis.py): the real app, with
deliveries off and a stub resolver, because the fuzzer invents host names and none may reach real DNS.
`gunicorn tests.fuzz_wsgi:app`, with PARTNER_DATABASE_URL and PARTNER_SCHEDULER_ENABLED=false set."""

from tests.support import started_app

# The one name the document's examples use resolves to a public address, so creating a subscription
# succeeds; nothing is ever sent to it (no scheduler). Every other name does not resolve.
RESOLVED = {"hooks.partner.example": ["93.184.215.14"]}


def resolve(host: str) -> list[str]:
    return list(RESOLVED.get(host.lower().rstrip("."), []))


app = started_app({"RESOLVER": resolve, "SCHEDULER_ENABLED": False})
