"""What both apps share over HTTP: strict body decoding, RFC 9457 problem+json errors, the
bounded answer cache and the OpenAPI assembly from msgspec's own JSON Schema. Imports the core
and Litestar only."""
