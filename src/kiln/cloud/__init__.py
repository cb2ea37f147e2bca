"""Publishing images to clouds: `kiln release upload` (an AWS AMI through the EBS direct APIs, an Azure page blob)."""
