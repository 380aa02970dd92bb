"""What a message carries, pure: header names and the copy recipe, the wire's limits, the stored
form of headers and properties."""
