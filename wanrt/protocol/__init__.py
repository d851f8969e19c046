"""Sans-IO wire protocol of wanrt: framing, message schemas, handshake and the connection state machine."""
