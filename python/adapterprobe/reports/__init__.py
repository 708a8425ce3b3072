"""Human-readable reports of scan records (HTML)."""
