"""Records in, records and state changes out, with no broker: the engine behind each
run key (`record_processor`), the history and dead-letter records it publishes, sized
before they are sent (`outputs`), and each key's state as the changelog stores it
(`stored_keys`). The runtime drives it; the tests drive it without Kafka."""
