"""Starting the system and talking to it: one harness for devhost, the tests, chaos and bench.

`process` starts and stops a child, `services` says how each service is started and how
it announces that it is up, `clients` speak the app's and the emulators' HTTP APIs, and
`stack` puts the whole system up on free loopback ports.
"""
