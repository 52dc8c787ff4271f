"""One ClickHouse target: embedded or a server, its clients, where its tables live."""
