"""The method contract, the payload wire format and the contexts methods run in."""
