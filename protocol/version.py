"""Version numbers. PROTOCOL_VERSION is the wire major version: peers reject other majors."""

PROTOCOL_VERSION = 1
SOFTWARE_VERSION = "0.1.0"
