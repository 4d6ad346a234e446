from django.apps import AppConfig


class EvaluationConfig(AppConfig):
    name = "evaluation"
    verbose_name = "Evaluation: metrics and paper tables"

    def ready(self):
        from core.caching import shows_on

        from .models import Bisection, BisectionProbe, Evaluation

        # What this app's template tags render on the catalog's pages (the leaderboard box, detections, bisections)
        shows_on("catalog", Evaluation)
        shows_on("bug", Evaluation, Bisection, BisectionProbe)
