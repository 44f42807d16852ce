//! Wire types of the colibri line protocol.
