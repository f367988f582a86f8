"""Email: the email_send kind, its checked addresses and its SMTP delivery."""
