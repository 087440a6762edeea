"""Named volumes: host directories bind-mounted read-write into every sandbox that names them."""
