// Verifies one delivery with the npm standardwebhooks library, for tests/test_standard_webhooks.py.
// Reads {"secret", "raw_key", "headers", "body" (base64)} as JSON on stdin, so the secret is never in
// argv; exits 0 when verified, else 1 with the library's message (never the secret) on stderr.
"use strict";
const { Webhook } = require("standardwebhooks");

let input = "";
process.stdin.setEncoding("utf8");
process.stdin.on("data", (chunk) => { input += chunk; });
process.stdin.on("end", () => {
  const { secret, raw_key: rawKey, headers, body } = JSON.parse(input);
  try {
    // raw_key: docs/webhooks.md's way for a secret issued before release 1.4 (base64url).
    const webhook = rawKey
      ? new Webhook(Buffer.from(secret.slice("whsec_".length), "base64url"), { format: "raw" })
      : new Webhook(secret);
    webhook.verify(Buffer.from(body, "base64"), headers);
  } catch (error) {
    process.stderr.write(`${error.message}\n`);
    process.exit(1);
  }
});
