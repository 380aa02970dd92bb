"""What a message carries, pure (no I/O).

- ``headers``: the header names rabbitretry reads and writes, and the one recipe for a
  republished copy's headers and properties;
- ``wire``: the limits of the AMQP wire format (what the codec and the broker refuse);
- ``storable``: the lossless form in which headers and properties are stored in the ledger.
"""
