from django.urls import path

from . import views

app_name = "evaluation"
urlpatterns = [
    path("", views.results, name="results"),
    path("runs/", views.run_list_page, name="runs"),
    path("compare/", views.compare, name="compare"),
    path("compare.<slug:fmt>", views.compare_export, name="compare-export"),
    path("versions/", views.versions, name="versions"),
    path("versions.<slug:fmt>", views.versions_download, name="versions-export"),
    path("bisections/", views.bisections, name="bisections"),
    path("bisections/start/", views.bisection_start, name="bisection-start"),
    path("bisections/<int:pk>/", views.bisection_detail, name="bisection"),
    path("sensitivity/", views.sensitivity, name="sensitivity"),
    path("sensitivity/<slug:table>.<slug:fmt>", views.sensitivity_download, name="sensitivity-export"),
    path("<slug:table>.<slug:fmt>", views.export_table, name="export"),
]
