"""The life of an instance: start, register, heartbeat, pulse, rebalance rounds, the
workers it starts and stops, its watchdog, its signals and its graceful stop."""
