"""What every stage agrees on: table names, the row contract, a target's design and identity, types, offsets
and the run configuration."""
