"""One line -> one typed row: a change event, a transaction marker, a dead letter or a control record."""
