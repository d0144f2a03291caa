"""aircli: the commands researchers and admins type. Parse, call one RPC, print."""
